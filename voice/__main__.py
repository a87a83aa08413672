from voice.cli import app

app()
