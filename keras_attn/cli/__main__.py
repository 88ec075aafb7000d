"""`python -m keras_attn.cli ...`: the `keras-attn` command."""

import sys

from keras_attn.cli.command_line import main

sys.exit(main())
