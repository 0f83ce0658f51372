"""Generators of shipped files, each checked by a test that the shipped file is its output:
the regression set (`python -m ops.generate.regression_set`), the settings table of
docs/settings.md (`python -m ops.generate.settings_doc`), and a held-out set of messy inputs
(`python -m ops.generate.messy_set`)."""
