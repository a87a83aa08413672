"""Helpers shared by the test modules, which import them from here (never from another test
module or from conftest): `server` (a real `hotline serve` process: start, read its log, stop),
`speech` (test speech from espeak-ng and piper, silence, framing), `redis_server` (a real
`redis-server` process), `conversation` (scripted STT, LLM and TTS and a real-time phone line
for the per-call loop), `routing` (a TierRouter rig against the tier simulator) and
`providers` (the Twilio, Telnyx and Vonage media-websocket wires)."""
