-- serve.adapter.experiment was a label nothing read (the split's salt is serve.route.experiment).
ALTER TABLE serve.adapter DROP COLUMN experiment;
