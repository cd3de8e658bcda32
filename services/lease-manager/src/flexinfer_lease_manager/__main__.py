from flexinfer_lease_manager.main import run

run()
