"""`python -m scripts.sagemaker VERB ...`: see scripts/sagemaker/cli.py."""

import sys

from .cli import main

sys.exit(main())
