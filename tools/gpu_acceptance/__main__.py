"""``python -m tools.gpu_acceptance --out DIR``: see :mod:`tools.gpu_acceptance`."""

if __name__ == "__main__":
    from tools.gpu_acceptance._driver import main

    raise SystemExit(main())
