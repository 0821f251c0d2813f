"""Repository tooling (release checks, the GPU acceptance command); not part of the wheel."""
