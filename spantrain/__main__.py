from spantrain.cli import main

raise SystemExit(main())
