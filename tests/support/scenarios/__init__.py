"""Scenarios, and the model they train, that several test modules run on
their ranks (tests/support/harness.py ships them by module and name). A
test module's own scenarios sit beside its tests, in its scenarios section."""
