"""Training performance benchmarks: `make bench` / `python -m scripts.bench`."""
