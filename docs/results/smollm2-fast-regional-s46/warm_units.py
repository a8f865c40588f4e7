"""The bench's warm-up unit by unit (compiled_units' debug log): acchead-bench's arguments, e.g. fast.sh's
with one MT-bench prompt of 8 tokens (runs/s46/warm_units.log; its "ready in" lines are per unit)."""

import logging
import sys

from acchead.inference.bench.run import main

logging.basicConfig(level=logging.WARNING, format="%(relativeCreated)9.0f ms %(message)s")
logging.getLogger("acchead.inference.compiled_units").setLevel(logging.DEBUG)
main(sys.argv[1:])
