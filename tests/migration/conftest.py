"""Migrated examples: code written the way each peer library's users write it.

They are imported by tests/test_migration_*.py (which compare them with independent
references), never collected on their own: each registers kernels under fixed names, and
importing one twice would replace them.
"""

collect_ignore_glob = ["*_example.py", "_load.py"]
