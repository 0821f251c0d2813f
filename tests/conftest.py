"""Test-suite configuration."""

# Scripts run in subprocesses (several simulated devices, several processes): they parse
# their own command line at import, so pytest must not import them for doctests.
collect_ignore_glob = ["sharding_scripts/*"]
