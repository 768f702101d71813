"""Test infrastructure that is more than a fixture: the stand-in Hugging Face hub (:mod:`.standin_hub`).

Not part of the library (``coupling_utils`` never imports it). The tests import it as
``support.<module>`` (pytest puts ``tests/`` on ``sys.path``); from a shell, run it from the
repository root as ``python -m tests.support.<module>``.
"""
