-- Judge calibration: a suite's calibration set (answers people labelled acceptable or not under
-- the suite's rubric), a judge run over it, and how well the judge agrees with the people:
-- accuracy, Cohen's kappa and bias (judge positive rate - human positive rate). The gate takes a
-- required judge-scored result (judge_model set) only from a judge calibrated on that suite with
-- that rubric version and kappa >= the rule's min_judge_kappa (serve/can_promote.sql).

CREATE TABLE train.eval_calibration_case (
  id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  suite_id    text NOT NULL,
  messages    jsonb NOT NULL CHECK (jsonb_typeof(messages) = 'array'),
  answer      text NOT NULL,     -- the answer to the conversation that people judged
  human_label boolean NOT NULL,  -- people's verdict: acceptable under the rubric
  author      text NOT NULL,     -- who labelled it (set by the database, train.current_author)
  created_at  timestamptz NOT NULL DEFAULT now(),
  tenant_id   int NOT NULL,
  FOREIGN KEY (tenant_id, suite_id) REFERENCES train.eval_suite (tenant_id, id) ON DELETE CASCADE
);
CREATE INDEX eval_calibration_case_suite_idx ON train.eval_calibration_case (suite_id, id);

-- One run of one judge (model + rubric version) over a suite's whole calibration set.
CREATE TABLE train.judge_calibration (
  id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  suite_id            text NOT NULL,
  judge_model         text NOT NULL,
  rubric_version      text NOT NULL,
  threshold           numeric NOT NULL,  -- a judge score >= threshold reads as "acceptable"
  n                   int NOT NULL,
  accuracy            numeric,           -- share of cases where the judge agrees with people
  kappa               numeric,           -- Cohen's kappa; NULL if chance agreement is 1
  bias                numeric,           -- judge positive rate - human positive rate
  judge_positive_rate numeric,
  human_positive_rate numeric,
  author_role         text NOT NULL,     -- who ran it (train.current_author)
  author              text NOT NULL,
  calibrated_at       timestamptz NOT NULL DEFAULT now(),
  tenant_id           int NOT NULL,
  FOREIGN KEY (tenant_id, suite_id) REFERENCES train.eval_suite (tenant_id, id) ON DELETE CASCADE
);
CREATE INDEX judge_calibration_judge_idx
  ON train.judge_calibration (suite_id, judge_model, rubric_version, calibrated_at DESC);

-- The judge's verdict on each case of a calibration (the human label as it was then).
CREATE TABLE train.judge_verdict (
  calibration_id bigint NOT NULL REFERENCES train.judge_calibration(id) ON DELETE CASCADE,
  case_id        bigint NOT NULL REFERENCES train.eval_calibration_case(id) ON DELETE CASCADE,
  judge_score    numeric,          -- NULL: the reply held no score (read as not acceptable)
  judge_reply    text,
  judge_label    boolean NOT NULL,
  human_label    boolean NOT NULL,
  PRIMARY KEY (calibration_id, case_id)
);
