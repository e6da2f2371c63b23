#!/usr/bin/env node
// A tiny OpenAI-compatible chat-completions server on 127.0.0.1 (never anything else) for
// make_cli_fixture.mjs: POST /v1/chat/completions with `stream: true` answers in server-sent
// events the way pi's openai-completions client reads them (role, content or tool-call deltas, a
// finish reason, then a usage chunk and [DONE]). Answers are deterministic:
//
// * a summarization request (pi's summarizer system prompt) gets a fixed structured summary;
// * right after tool results, a short text answer;
// * a user message asking to "read <path>" gets a `read` tool call for that path;
// * anything else gets a text answer of a length that depends on the prompt's.
//
// Usage: node fake_openai.mjs [PORT]   (prints the port; also importable: startFakeOpenAI())

import { createServer } from "node:http";
import { pathToFileURL } from "node:url";

const WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"];
const words = (seed, n) => Array.from({ length: n }, (_, i) => `${WORDS[(seed + i) % WORDS.length]}${(seed * 3 + i) % 89}`).join(" ");

const text = (message) =>
	typeof message.content === "string"
		? message.content
		: (message.content ?? []).filter((p) => p.type === "text").map((p) => p.text).join("\n");

/** What the fake model says to one request body: {content} or {toolCall: {name, arguments}}. */
export function answer(body, index) {
	const messages = body.messages ?? [];
	const system = messages.filter((m) => m.role === "system" || m.role === "developer").map(text).join("\n");
	const last = messages[messages.length - 1] ?? { role: "user", content: "" };
	if (/summarization assistant/.test(system) || /<conversation>/.test(text(last))) {
		return { content: `## Goal\nFake summary ${index}: ${words(index, 12)}\n\n## Progress\n### Done\n- [x] ${words(index + 5, 6)}` };
	}
	if (last.role === "tool") return { content: `Read it: ${words(index, 30)}` };
	const asked = text(last).match(/\bread ([\w./-]+)/);
	if (asked) return { toolCall: { name: "read", arguments: JSON.stringify({ path: asked[1] }) } };
	return { content: `Answer ${index}: ${words(index, 20 + (text(last).length % 40))}` };
}

function chunk(id, delta, finish = null) {
	return { id, object: "chat.completion.chunk", created: 1_780_000_000, model: "fake-model", choices: [{ index: 0, delta, finish_reason: finish }] };
}

/** Start the server; resolves to {port, requests, close()} (`requests`: every body received). */
export function startFakeOpenAI(port = 0) {
	const requests = [];
	const server = createServer((req, res) => {
		let raw = "";
		req.on("data", (d) => (raw += d));
		req.on("end", () => {
			if (req.method !== "POST" || !req.url.endsWith("/chat/completions")) {
				res.writeHead(404, { "content-type": "application/json" });
				res.end(JSON.stringify({ error: { message: `no ${req.method} ${req.url} here` } }));
				return;
			}
			const body = JSON.parse(raw);
			requests.push(body);
			const index = requests.length;
			const reply = answer(body, index);
			const id = `chatcmpl-fake-${index}`;
			const prompt = Math.ceil(raw.length / 4);
			const completion = Math.ceil((reply.content ?? reply.toolCall.arguments).length / 4) + 5;
			const events = [chunk(id, { role: "assistant", content: "" })];
			if (reply.content) {
				for (const piece of reply.content.match(/[\s\S]{1,40}/g)) events.push(chunk(id, { content: piece }));
				events.push(chunk(id, {}, "stop"));
			} else {
				const call = { index: 0, id: `call_fake_${index}`, type: "function", function: { name: reply.toolCall.name, arguments: "" } };
				events.push(chunk(id, { tool_calls: [call] }));
				events.push(chunk(id, { tool_calls: [{ index: 0, function: { arguments: reply.toolCall.arguments } }] }));
				events.push(chunk(id, {}, "tool_calls"));
			}
			events.push({ id, object: "chat.completion.chunk", created: 1_780_000_000, model: "fake-model", choices: [], usage: { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion } });
			res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "close" });
			for (const event of events) res.write(`data: ${JSON.stringify(event)}\n\n`);
			res.end("data: [DONE]\n\n");
		});
	});
	return new Promise((resolveStart, rejectStart) => {
		server.once("error", rejectStart);
		server.listen(port, "127.0.0.1", () => {
			resolveStart({ port: server.address().port, requests, close: () => new Promise((r) => server.close(r)) });
		});
	});
}

const isMain = process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href;
if (isMain) {
	const { port } = await startFakeOpenAI(Number.parseInt(process.argv[2] ?? "0", 10));
	process.stdout.write(`${port}\n`);
}
