from ggml_bitcos.cli import main

raise SystemExit(main())
