from fairgpu.cli import app

app()
