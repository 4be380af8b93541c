import pytest


def test_skips():
    pytest.skip("needs a GPU")
