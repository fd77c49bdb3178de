import sys

from thinkrl.cli import main

sys.exit(main())
