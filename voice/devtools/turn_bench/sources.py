"""The human recordings the turn set is built from, fetched once into the cache.

- Debian `asterisk-core-sounds-en-wav` + `asterisk-core-sounds-en` (CC-BY-SA-3.0): one
  professional speaker (Allison), 8 kHz s16 mono WAVs under
  `usr/share/asterisk/sounds/en_US_f_Allison/`, transcripts in
  `usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz` (`name: text`). Fetched with
  `apt-get download` (no root needed) in a temporary directory and unpacked with `dpkg-deb -x`.
- The `pocketsphinx` 5.1.1 sdist's `test/data/librivox/`: 5 LibriVox clips (public domain,
  16 kHz) with transcripts and per-clip `.json` word alignments (`w`: `b` begin s, `d`
  duration s, `t` word). The sdist's URL and sha256 are read from PyPI's simple index; the hash
  is checked before anything is extracted; only that folder is kept.

Everything lands in `$HOTLINE_CACHE_DIR/turn-bench/sources` (default
`~/.cache/hotline/turn-bench/sources`), written to a temporary directory and renamed into place.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
import subprocess
import tarfile
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.stt import cache_dir
from voice.audio import PCM, read_wav

ASTERISK_PACKAGES = ("asterisk-core-sounds-en-wav", "asterisk-core-sounds-en")
ASTERISK_SOUNDS = "asterisk/usr/share/asterisk/sounds/en_US_f_Allison"
ASTERISK_TEXT = "asterisk/usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz"
POCKETSPHINX = "pocketsphinx-5.1.1.tar.gz"
POCKETSPHINX_INDEX = "https://pypi.org/simple/pocketsphinx/"
LIBRIVOX = "pocketsphinx-5.1.1/test/data/librivox/"
_DONE = ".complete"


def bench_dir() -> Path:
    """`$HOTLINE_CACHE_DIR/turn-bench` (default `~/.cache/hotline/turn-bench`)."""
    return cache_dir() / "turn-bench"


def sources_dir() -> Path:
    """The unpacked sources, fetched on first use (a minute; needs apt and PyPI once)."""
    target = bench_dir() / "sources"
    if (target / _DONE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".sources.", dir=target.parent))
    try:
        _fetch_asterisk(building)
        _fetch_librivox(building)
        (building / _DONE).write_text("ok\n")
        if target.exists():
            stale = target.parent / f".sources.{uuid.uuid4().hex}.stale"
            target.rename(stale)
            shutil.rmtree(stale, ignore_errors=True)
        building.rename(target)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target


def _fetch_asterisk(into: Path) -> None:
    with tempfile.TemporaryDirectory() as work:
        subprocess.run(
            ["apt-get", "download", *ASTERISK_PACKAGES],
            cwd=work,
            check=True,
            capture_output=True,
            timeout=300,
        )
        for deb in sorted(Path(work).glob("*.deb")):
            subprocess.run(
                ["dpkg-deb", "-x", str(deb), str(into / "asterisk")], check=True, timeout=120
            )


def sdist_url(index_html: str) -> tuple[str, str]:
    """(URL, sha256) of the pocketsphinx 5.1.1 sdist in PyPI's simple index page."""
    for href in re.findall(r'href="([^"]+)"', index_html):
        url, _, fragment = href.partition("#sha256=")
        if url.split("/")[-1] == POCKETSPHINX and fragment:
            return url, fragment
    raise RuntimeError(f"{POCKETSPHINX} not in {POCKETSPHINX_INDEX}")


def _fetch_librivox(into: Path) -> None:
    import httpx

    with httpx.Client(timeout=60, follow_redirects=True) as client:
        url, sha256 = sdist_url(client.get(POCKETSPHINX_INDEX).raise_for_status().text)
        data = client.get(url).raise_for_status().content
    if hashlib.sha256(data).hexdigest() != sha256:
        raise RuntimeError(f"{POCKETSPHINX}: sha256 mismatch")
    out = into / "librivox"
    out.mkdir()
    with tempfile.NamedTemporaryFile(suffix=".tar.gz") as archive:
        archive.write(data)
        archive.flush()
        with tarfile.open(archive.name) as tar:
            for member in tar.getmembers():
                name = member.name
                if not (name.startswith(LIBRIVOX) and member.isfile()):
                    continue
                if not name.endswith((".wav", ".txt", ".json")) or "." in Path(name).stem:
                    continue  # keep clip.wav / clip.txt / clip.json, not clip.phone.json
                source = tar.extractfile(member)
                if source is not None:
                    (out / Path(name).name).write_bytes(source.read())


@dataclass(frozen=True)
class Clip:
    """One recording: its words and its audio (int16 mono at 16 kHz, resampled if need be)."""

    name: str
    text: str
    audio: PCM
    source_rate: int  # 8000: an Asterisk clip upsampled; 16000: LibriVox
    words: tuple[tuple[str, float, float], ...] = ()  # (word, begin s, end s) if aligned


def asterisk_clips(root: Path) -> dict[str, Clip]:
    """Every Allison clip with a transcript, by name ("vm-whichbox", "digits/5")."""
    clips: dict[str, Clip] = {}
    with gzip.open(root / ASTERISK_TEXT, "rt", encoding="utf-8", errors="replace") as lines:
        for line in lines:
            name, sep, text = line.partition(":")
            wav = root / ASTERISK_SOUNDS / f"{name.strip()}.wav"
            if sep and not line.startswith(";") and wav.is_file():
                clips[name.strip()] = Clip(name.strip(), text.strip(), read_wav(wav), 8000)
    return clips


def librivox_clips(root: Path) -> dict[str, Clip]:
    """The LibriVox clips with their word alignments (silences and pronunciation variants
    dropped: "to(3)" is "to")."""
    clips: dict[str, Clip] = {}
    for wav in sorted((root / "librivox").glob("*.wav")):
        text = wav.with_suffix(".txt").read_text().strip()
        aligned = json.loads(wav.with_suffix(".json").read_text()).get("w", [])
        words = tuple(
            (str(w["t"]).split("(")[0], float(w["b"]), float(w["b"]) + float(w["d"]))
            for w in aligned
            if not str(w["t"]).startswith("<")
        )
        audio = np.ascontiguousarray(read_wav(wav), dtype=np.int16)
        clips[wav.stem] = Clip(wav.stem, text, audio, 16000, words)
    return clips
