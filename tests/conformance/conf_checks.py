"""conf_checks.py — what the conformance tests share to report: check() prints each check and
remembers the failures, rel_err() is the relative error they state tolerances in, expect_error()
checks that loom refuses something with a message, finish() ends a test (exit status 0 or 1)."""
import numpy as np

failures = []


def check(cond, msg):
    print(("ok   " if cond else "FAIL ") + msg)
    if not cond:
        failures.append(msg)


def rel_err(a, b):
    """Largest absolute difference over the root mean square of the reference b."""
    return float(np.max(np.abs(a - b)) / np.sqrt(np.mean(np.asarray(b, np.float64) ** 2)))


def expect_error(make, what, needles):
    """make() must raise loom.LoomError whose message holds every needle."""
    import loom
    try:
        obj = make()
        obj.close()
        check(False, f"{what}: accepted")
    except loom.LoomError as err:
        msg = str(err)
        check(all(n in msg for n in needles), f"{what}: refused: {msg}")


def finish(what):
    """The test's exit status, after listing its failures or saying all passed."""
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print(f"{what}: all checks passed")
    return 0
