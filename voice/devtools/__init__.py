"""Developer tools: scripted callers (WebRTC and phone), the benchmark, the soak test, the WER
and end-of-turn studies."""
