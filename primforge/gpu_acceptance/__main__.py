"""``python -m primforge.gpu_acceptance --out DIR``: see :mod:`primforge.gpu_acceptance`."""

if __name__ == "__main__":
    from primforge.gpu_acceptance._driver import main

    raise SystemExit(main())
