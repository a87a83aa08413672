"""Who answered an outbound call: a person or an answering machine (AMD).

`detector.AnsweringMachineDetector` decides from the first seconds of the callee's audio (20 ms
16 kHz PCM16 frames) and early transcripts: the opening's shape (Silero VAD), the voicemail
beep (`tone`), machine phrases in the transcript (`words`). Its clock is the audio itself
(samples since the answer), so `hotline amd-bench` replays recorded openings exactly as a call
decides live. Pure: no I/O, nothing from `voice/`. `screening.Screening` runs it on a placed
call: nothing is said before the verdict, and a machine gets its message after the beep.
"""
