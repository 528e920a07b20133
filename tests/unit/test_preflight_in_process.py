"""The pre-flight check's judgement of the operating system, in this process."""
from __future__ import annotations


def test_a_system_other_than_linux_is_refused_in_one_sentence() -> None:
    from fourcard_helpers.preflight import Findings, check_system

    for platform, refused in (("linux", False), ("darwin", True), ("win32", True)):
        found = Findings()
        check_system(found, platform)
        assert bool(found.problems) == refused
    assert found.problems == ["this is win32, and the course runs on Linux only. Fix: on Windows, use WSL 2 "
                              "(a Linux); on macOS, a Linux virtual machine or container"]
