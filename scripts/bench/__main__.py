import sys

from scripts.bench.runner import main

sys.exit(main())
