"""Checksums of large checkpoint files, piece by piece on many threads: the
pieces are sha256sum's of the byte ranges, a changed byte in any piece is
named, and a list written before pieces existed (one sha256 of a file
larger than a piece) still verifies."""

from __future__ import annotations

import hashlib
import json

import pytest

from thinkrl.checkpoint import verify
from thinkrl.checkpoint.verify import MARKER, DamagedCheckpoint, file_digests, verify_checkpoint


@pytest.fixture
def small_pieces(monkeypatch):
    monkeypatch.setattr(verify, "PIECE_BYTES", 1000)


def _folder(tmp_path, listed=None):
    folder = tmp_path / "global_step_1"
    (folder / "actor").mkdir(parents=True)
    blob = bytes(range(256)) * 10  # 2560 bytes: pieces of 1000, 1000 and 560
    (folder / "actor" / "optimizer.pt").write_bytes(blob)
    (folder / "trainer_state.pt").write_bytes(b"small")
    listed = listed or file_digests(folder)
    (folder / MARKER).write_text(json.dumps({"files": listed}))
    return folder, blob


def test_a_file_past_one_piece_is_listed_piece_by_piece(tmp_path, small_pieces):
    folder, blob = _folder(tmp_path)
    listed = json.loads((folder / MARKER).read_text())["files"]
    assert listed["trainer_state.pt"] == {"bytes": 5, "sha256": hashlib.sha256(b"small").hexdigest()}
    assert listed["actor/optimizer.pt"] == {
        "bytes": 2560, "piece_bytes": 1000,
        "sha256_pieces": [hashlib.sha256(blob[i:i + 1000]).hexdigest() for i in (0, 1000, 2000)]}
    assert verify_checkpoint(folder)


def test_a_changed_byte_in_the_last_piece_is_named(tmp_path, small_pieces):
    folder, blob = _folder(tmp_path)
    changed = bytearray(blob)
    changed[2100] ^= 1
    (folder / "actor" / "optimizer.pt").write_bytes(bytes(changed))
    with pytest.raises(DamagedCheckpoint, match=r"actor/optimizer.pt \(bytes 2000-2559\) does not match its "
                                                 r"saved sha256"):
        verify_checkpoint(folder)


def test_verifying_a_file_of_pieces_hashes_each_piece_as_a_task_of_its_own(tmp_path, small_pieces, monkeypatch):
    """Resuming a 7B run verified its 60 GB optimizer file on one core (~40 s)."""
    folder, _ = _folder(tmp_path)
    listed = json.loads((folder / MARKER).read_text())["files"]
    assert [(rel, start, length) for rel, start, length, _ in verify.hash_tasks(listed)] == [
        ("actor/optimizer.pt", 0, 1000), ("actor/optimizer.pt", 1000, 1000), ("actor/optimizer.pt", 2000, 1000),
        ("trainer_state.pt", 0, None)]
    hashed_on = set()
    original = verify.sha256_file

    def remember_thread(path, start=0, length=None):
        import threading
        import time
        time.sleep(0.05)  # long enough for the pool to hand the next piece to another thread
        if path.name == "optimizer.pt":  # the one file: its pieces alone must spread
            hashed_on.add(threading.get_ident())
        return original(path, start, length)

    monkeypatch.setattr(verify, "sha256_file", remember_thread)
    monkeypatch.setattr(verify, "_threads", lambda: 4)
    assert verify_checkpoint(folder)
    assert len(hashed_on) >= 2


def test_a_whole_file_checksum_of_an_earlier_release_still_verifies(tmp_path, small_pieces):
    blob = bytes(range(256)) * 10
    old = {"actor/optimizer.pt": {"bytes": 2560, "sha256": hashlib.sha256(blob).hexdigest()},
           "trainer_state.pt": {"bytes": 5, "sha256": hashlib.sha256(b"small").hexdigest()}}
    folder, _ = _folder(tmp_path, listed=old)
    assert verify_checkpoint(folder)
