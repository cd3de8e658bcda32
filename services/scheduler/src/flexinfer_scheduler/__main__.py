from flexinfer_scheduler.main import run

run()
