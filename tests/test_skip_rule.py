"""The suite's rule on skips (tests/conftest.py): a skip for anything but a listed absence fails the session.

Each test runs pytest in-process on a tiny test file beside a copy of this suite's conftest.py, the rule as shipped.
"""

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).resolve().parent / "conftest.py").read_text()


@pytest.fixture
def suite(pytester, monkeypatch):
    """``suite(source, *args)``: the outcome of pytest on one test file holding ``source``, under the rule, outside
    CI unless the caller sets CI."""
    monkeypatch.delenv("CI", raising=False)
    pytester.makeconftest(CONFTEST)

    def run(source: str, *args: str) -> pytest.RunResult:
        pytester.makepyfile(test_tiny=source)
        return pytester.runpytest("-p", "no:cacheprovider", "-rs", *args)

    return run


def test_an_unlisted_skip_fails_the_session_and_is_listed(suite):
    result = suite("import pytest\n"
                   "def test_runs(): pass\n"
                   "def test_skipped(): pytest.skip('tensorboard is not installed')\n"
                   "@pytest.mark.skip(reason='broken for now')\n"
                   "def test_marked(): pass\n")
    result.assert_outcomes(passed=1, skipped=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*= skips that fail the session =*",
                                 "test_tiny.py::test_skipped: tensorboard is not installed",
                                 "test_tiny.py::test_marked: broken for now",
                                 "A test may be skipped only for an absence in tests/conftest.py ABSENCES (gpu, root)*"])
    result.stdout.fnmatch_lines(["SKIPPED *tensorboard is not installed"])  # -rs: the skip summary too


def test_a_module_skipped_by_importorskip_fails_the_session(suite):
    result = suite("import pytest\n"
                   "pytest.importorskip('hpc_rl_no_such_package')\n"
                   "def test_never_collected(): pass\n")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*= skips that fail the session =*",
                                 "test_tiny.py: could not import 'hpc_rl_no_such_package'*"])


def test_a_listed_absence_skips_and_the_session_passes(suite):
    result = suite("def test_runs(): pass\n"
                   "def test_needs_root(absent): absent('root', 'mounting a tmpfs needs root')\n")
    result.assert_outcomes(passed=1, skipped=1)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["SKIPPED *absent root: mounting a tmpfs needs root"])
    result.stdout.no_fnmatch_line("*skips that fail the session*")


def test_in_ci_the_absence_of_what_ci_provides_fails(suite, monkeypatch):
    monkeypatch.setenv("CI", "true")
    result = suite("def test_needs_root(absent): absent('root', 'mounting a tmpfs needs root')\n")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*mounting a tmpfs needs root, and CI (CI=true) runs with root*"])


def test_an_absence_not_listed_is_an_error(suite):
    result = suite("def test_needs_a_tpu(absent): absent('tpu', 'no TPU')\n")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*'tpu' is not an absence a test may be skipped for*"])
