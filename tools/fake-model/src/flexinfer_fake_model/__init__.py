"""A fake OpenAI-compatible model server for FlexInfer demos and tests (see ``flexinfer_fake_model.server``)."""
