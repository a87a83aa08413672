"""Turn-taking: is the caller's turn over, and is speech during the reply an interruption?

`model` scores a pause from the audio so far (Smart Turn v3.2); `policy` turns that score and
the early transcript into the silence that ends the turn. Decisions are pure functions of what
was heard so far, so `hotline turn-bench` replays them on recorded turns exactly as a call
decides them live.
"""
