from flexinfer_actuator.main import run

run()
