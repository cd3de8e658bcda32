from flexinfer_proxy.main import run

run()
