// Drives a fine-tune through cft with the official openai Node SDK and no cft-specific code:
// upload, create a job, poll it and its events until it ends, list its checkpoints, chat with
// the fine-tuned model, then create a second job and cancel it. Prints one JSON summary.
// Environment: CFT_BASE_URL (…/v1), CFT_TRAINER_KEY, CFT_CLIENT_KEY, CFT_MODEL, CFT_FILE.
import fs from "node:fs";
import OpenAI from "openai";

const env = process.env;
const trainer = new OpenAI({ baseURL: env.CFT_BASE_URL, apiKey: env.CFT_TRAINER_KEY, maxRetries: 0 });
const client = new OpenAI({ baseURL: env.CFT_BASE_URL, apiKey: env.CFT_CLIENT_KEY, maxRetries: 0 });
const out = {};

const file = await trainer.files.create({ file: fs.createReadStream(env.CFT_FILE), purpose: "fine-tune" });
out.file = file;
let job = await trainer.fineTuning.jobs.create({
  model: env.CFT_MODEL,
  training_file: file.id,
  suffix: "node",
  seed: 7,
  method: { type: "supervised", supervised: { hyperparameters: { n_epochs: 1, batch_size: 2 } } },
});
out.created = job;
const deadline = Date.now() + 240_000;
while (!["succeeded", "failed", "cancelled"].includes(job.status)) {
  if (Date.now() > deadline) throw new Error(`job ${job.id} still ${job.status}`);
  await new Promise((r) => setTimeout(r, 250));
  job = await trainer.fineTuning.jobs.retrieve(job.id);
}
out.finished = job;
const events = [];
for await (const event of trainer.fineTuning.jobs.listEvents(job.id, { limit: 2 })) events.push(event);
out.events = events;
const checkpoints = [];
for await (const c of trainer.fineTuning.jobs.checkpoints.list(job.id)) checkpoints.push(c);
out.checkpoints = checkpoints;
const jobs = [];
for await (const j of trainer.fineTuning.jobs.list({ limit: 1 })) jobs.push(j.id);
out.jobs = jobs;
out.chat = await client.chat.completions.create({
  model: job.fine_tuned_model,
  messages: [{ role: "user", content: "What is 2 plus 2?" }],
  max_tokens: 4,
  temperature: 0,
});
const second = await trainer.fineTuning.jobs.create({ model: env.CFT_MODEL, training_file: file.id });
out.cancelled = await trainer.fineTuning.jobs.cancel(second.id);
try {
  await trainer.fineTuning.jobs.cancel(second.id);
} catch (err) {
  out.cancel_again = { status: err.status, error: err.error };
}
process.stdout.write(JSON.stringify(out));
