from adaptive_spec.cli import main

raise SystemExit(main())
