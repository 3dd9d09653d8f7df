import sys

from launcher.main import main

sys.exit(main())
