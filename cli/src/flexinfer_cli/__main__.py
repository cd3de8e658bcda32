from flexinfer_cli.main import app

app(prog_name="flexinfer")
