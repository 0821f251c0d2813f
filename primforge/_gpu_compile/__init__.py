"""Private parts of :mod:`primforge.testing` that depend only on their arguments.

``results`` (what a compile gives back, and the errors), ``dump`` (reading XLA's dump
folder) and ``lowered`` (custom calls of a lowered module, ptxas on their PTX).
"""
