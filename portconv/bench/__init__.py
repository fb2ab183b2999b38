"""`portconv bench`: every backend and PyTorch over the benchmark suite, timed on the device, with a roofline."""
from .cli import add_parser, main
from .overhead import overhead
from .runner import Options, run
from .suite import DIRECTIONS, Row, load_suite

__all__ = ["DIRECTIONS", "Options", "Row", "add_parser", "load_suite", "main", "overhead", "run"]
