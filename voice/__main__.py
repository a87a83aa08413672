from voice.cli.main import app

app()
