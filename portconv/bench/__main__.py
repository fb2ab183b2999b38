"""`python -m portconv.bench ARGS` = `portconv bench ARGS`."""
import sys

from .cli import standalone

sys.exit(standalone())
