#!/usr/bin/env node
// tests/data/pi/cli-rpc.jsonl: a session written by pi's CLI itself (the pinned pi, run with the
// node 22 that npm ci installs here), not by a SessionManager we drive. pi runs in RPC mode
// (`--mode rpc`) against fake_openai.mjs on 127.0.0.1, configured through models.json and
// settings.json in a temporary agent directory (PI_CODING_AGENT_DIR) with a temporary HOME,
// offline (--offline, PI_OFFLINE, no version check, no telemetry, no MCP, no extensions) and
// with every proxy variable pointing at a closed loopback port, so nothing leaves the machine.
// The script sends prompts (one makes the fake model call pi's read tool), a bash command, a
// thinking-level change, a session name and a `compact` command, and one more prompt after it;
// then copies the session file, adds its cases to cases.json and records pi's answers.
//
// Usage: node make_cli_fixture.mjs   (from tests/conformance, after npm ci; PI_NODE overrides node)

import { spawnSync } from "node:child_process";
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startFakeOpenAI } from "./fake_openai.mjs";
import { makePiFolders, offlineEnv, rpcArgs, startRpc, writeFakeModels } from "./pi_cli.mjs";
import { dataDir, here, piVersion } from "./pi_package.mjs";

const NAME = "cli-rpc";
const root = mkdtempSync(join(tmpdir(), "pi-cli-fixture-"));
const { agentDir, sessionDir, home, cwd } = makePiFolders(root);

const server = await startFakeOpenAI();
writeFakeModels(agentDir, server.port);
// keepRecentTokens small enough that the manual compaction has something to summarize.
writeFileSync(join(agentDir, "settings.json"), JSON.stringify({ compaction: { enabled: true, keepRecentTokens: 150 } }));

const rpc = startRpc(rpcArgs(sessionDir), { cwd, env: offlineEnv({ home, agentDir }) });
const { command } = rpc;

let sessionFile;
try {
	await command({ type: "set_session_name", name: "cli fixture" });
	await command({ type: "prompt", message: "Please read notes.md and tell me what the plan is." }, { settle: true });
	await command({ type: "prompt", message: "Summarize the plan in two sentences." }, { settle: true });
	await command({ type: "bash", command: "echo checked" });
	await command({ type: "set_thinking_level", level: "off" });
	await command({ type: "prompt", message: "What should we check first, and why? Answer at length." }, { settle: true });
	await command({ type: "compact" });
	await command({ type: "prompt", message: "Continue after the compaction: what is left?" }, { settle: true });
	sessionFile = (await command({ type: "get_state" })).data.sessionFile;
} finally {
	await rpc.stop();
	await server.close();
}
if (!sessionFile) throw new Error(`pi reported no session file\n${rpc.stderr}`);

const target = join(dataDir, `${NAME}.jsonl`);
copyFileSync(sessionFile, target);
rmSync(root, { recursive: true, force: true });

const entries = readFileSync(target, "utf8").trim().split("\n").slice(1).map((l) => JSON.parse(l));
const compactionEntry = entries.find((e) => e.type === "compaction");
if (!compactionEntry) throw new Error("pi wrote no compaction entry");
const beforeCompaction = compactionEntry.parentId;
const firstUser = entries.find((e) => e.type === "message" && e.message.role === "user").id;
const keep = (n) => ["--keep-recent-tokens", String(n), "--no-adaptive-keep"];
const runs = {
	context: ["context"],
	contextBeforeCompaction: ["context", "--leaf", beforeCompaction],
	contextAtCompaction: ["context", "--leaf", compactionEntry.id],
	planDefault: ["plan", "--no-adaptive-keep"],
	planKeep60: ["plan", ...keep(60)],
	planKeep150: ["plan", ...keep(150)],
	planBeforeCompactionKeep150: ["plan", "--leaf", beforeCompaction, ...keep(150)],
	planBeforeCompactionKeep400: ["plan", "--leaf", beforeCompaction, ...keep(400)],
	branchToFirstUser: ["plan", "--from", entries[entries.length - 1].id, "--to", firstUser],
	serialize: ["serialize"],
	serializeBeforeCompaction: ["serialize", "--leaf", beforeCompaction],
};
const casesFile = join(dataDir, "cases.json");
const cases = JSON.parse(readFileSync(casesFile, "utf8"));
cases.fixtures[NAME] = { file: `${NAME}.jsonl`, runs };
writeFileSync(casesFile, `${JSON.stringify(cases, null, 2)}\n`);
process.stderr.write(`wrote ${target} (${entries.length} entries, pi ${piVersion} CLI, ${server.requests.length} model requests)\n`);

const recorded = spawnSync(process.execPath, [join(here, "pi_reference.mjs"), "record", "--only", NAME], { stdio: "inherit" });
process.exitCode = recorded.status ?? 1;
