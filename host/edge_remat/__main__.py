"""`python -m edge_remat`: the same as the `edge-remat` command."""

from .entry import main

if __name__ == "__main__":
    main()
