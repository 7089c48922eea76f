"""Training performance benchmarks (issue 6): `make bench` / `python -m scripts.bench`."""
