"""`python -m bench`: run the benchmark (options: `python -m bench --help`)."""

from bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
