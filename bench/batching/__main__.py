"""``python -m bench.batching``: the real-broker batching benchmark (see ``bench/batching/__init__.py``)."""

from bench.batching.cli import main

if __name__ == "__main__":
    main()
