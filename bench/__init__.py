"""Training performance benchmarks: `make bench` / `python -m bench`."""
