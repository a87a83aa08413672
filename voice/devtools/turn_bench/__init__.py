"""`hotline turn-bench`: end-of-turn detection measured on human speech, the eot-bench way.

- `sources`: the recordings (Debian's Asterisk prompts, pocketsphinx's LibriVox clips), fetched
  once into `$HOTLINE_CACHE_DIR/turn-bench`.
- `corpus` + `recipe`: caller turns built from them with a fixed seed, mid-turn pauses drawn
  from a calibrated log-normal mixture, each pause marked with its category.
- `decisions`: every silence of 100 ms or more, as the server's VAD hears the turn over the
  phone path (8 kHz μ-law) or at 16 kHz, with the Smart Turn v3.2 score and the early
  transcript of the audio up to it, and their inference times.
- `scoring`: each policy replayed with `pipeline.turn_taking.policy.end_delay_ms`, swept,
  Pareto-filtered and interpolated (cut-offs at 300 / 600 ms, delay at 5% / 10% cut-offs).
- `run` + `report`: one run; the tables, JSON and the Pareto plot.
"""
