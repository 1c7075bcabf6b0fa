"""Named fault points for crash tests: ``fault_point(name)`` does nothing unless the
environment variable ``FAK_FAULT_POINT`` names that point, and then SIGKILLs the process
right there (no ``finally``, no ``atexit``, no flush: what a power cut or the OOM killer
leaves). Tests and ``bench/faults.py`` run a child with the variable set and check what
the next open finds.

Points (``grep -rn fault_point``): ``cas.put.before_commit`` (blob renamed into place, its
row not committed), ``cas.forget.after_key_delete`` (data key deleted, the row still live),
``cas.forget.after_key_commit`` (key row deleted, ciphertext not yet),
``cas.rotate.after_new_kek``, ``cas.rotate.after_first_batch``, ``cas.keyring.before_commit.<kind>``
(a KEK, digest or check key being created), ``keyops.rotate.before_log``,
``keys.master.before_link`` and ``audit.signing_key.before_link`` (first-start key files),
``forget.after_requested``, ``forget.after_session``, ``forget.before_shred``,
``forget.before_completed``, ``forget.after_completed``, ``forget.before_replay`` and
``forget.after_replay_verified`` (the replay that completes the receipt, after the forget returned).
"""

from __future__ import annotations

import os
import signal

ENV = "FAK_FAULT_POINT"
# test fault injection, armed by the test harness in a child process: an allowed exception to "only fak.settings reads the environment" (tests/repo/test_settings_only_env_reader.py)
_ARMED = os.environ.get(ENV)  # read once: the hot paths pay one comparison of None


def fault_point(name: str) -> None:
    """SIGKILL this process here when ``$FAK_FAULT_POINT`` is ``name``."""
    if _ARMED is not None and name == _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
