"""How a call behaves, apart from its models (`pipeline.conversation.Conversation`'s settings;
the server's `HOTLINE_CONVERSATION__...`)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from pipeline.turn_taking.barge_in import BargeInSettings


class ConversationSettings(BaseModel):
    """How a call behaves, apart from its models."""

    greeting: str | None = None  # spoken when the call starts, if set
    # Spoken when no tier could answer a turn (every one failed).
    apology: str = "Sorry, I can't answer that right now. Please say it again in a moment."
    # Keys pressed within this long of each other make one keypad turn ("#" ends it at once).
    keypad_timeout_s: float = 1.5
    # At hang-up, how long to wait for the transcript of a turn still being transcribed, so
    # that its words are recorded too.
    hang_up_stt_s: float = 5.0
    # Synthesis follows playback: a sentence is synthesized once the one this many places
    # before it has played, so a long reply (or a caller who stops listening) costs neither
    # memory nor TTS time ahead of the ear.
    sentences_ahead: int = Field(default=2, ge=1)
    # A later sentence waits behind other calls' first chunks for the synthesis line until the
    # audio before it has this long left to play; then it goes ahead of the ones that came after.
    urgent_before_s: float = Field(default=1.0, ge=0.0)
    # Said when the line runs dry inside a reply because its next sentence is still being
    # synthesized (a loaded voice): a hesitation instead of a silence the caller takes for the
    # reply's end and talks into (pipeline/speaking.py). Empty: silence.
    gap_filler: str = "Um,"
    # Start the reply at the caller's pause (LLM request, first chunk synthesised), and speak
    # it the moment the turn ends there (pipeline/speculation.py). Off: reply at the endpoint.
    speculate: bool = True
    # A long turn is transcribed piece by piece while the caller speaks: at a pause, once this
    # much of its audio is new, its words are kept, and the turn's end decodes only the rest
    # (pipeline/long_turns.py). 0: every transcription covers the whole turn.
    long_turn_piece_s: float = Field(default=6.0, ge=0.0)
    barge_in: BargeInSettings = Field(default_factory=BargeInSettings)  # speech over the reply
