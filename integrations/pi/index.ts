// pi hands its compactions to us: the orchestrator's pi extension.
//
// pi plans a compaction (or collects the entries of the branch it leaves in /tree) and emits
// `session_before_compact` (or `session_before_tree`) with that preparation. This extension sends
// it to `orchestrator serve` over its Unix socket (`summary.compact`, `summary.branch`), where it
// runs through the orchestrator's operation machine: its routes and candidate models, retries,
// hooks, journal (written beside pi's session file) and traces. pi keeps the file: it appends
// the entry with our summary, `details` and `usage`, and marks it `fromHook`.
//
// pi's abort signal cancels our operation (`summary.cancel`). When the server cannot be reached
// or fails, ORCHESTRATOR_ON_FAILURE says what happens: `fallback` (the default) lets pi's own
// compaction run, `cancel` cancels the compaction (or the navigation); a notification says which.
// See docs/pi-extension.md.

import { randomUUID } from "node:crypto";
import type { ExtensionAPI } from "@earendil-works/pi-coding-agent";
import { Connection, describe, type Endpoint, endpointFromEnv, RpcFailure } from "./client.ts";

const CONNECT_TIMEOUT_MS = 2000;
/** After pi's abort, how long to wait for the server to settle the cancelled operation. */
const CANCEL_WAIT_MS = 5000;

type Outcome = { kind: "ok"; result: any } | { kind: "aborted" } | { kind: "failed"; message: string };
type Mode = "fallback" | "cancel";

function failureMode(env: NodeJS.ProcessEnv = process.env): Mode {
	return env.ORCHESTRATOR_ON_FAILURE === "cancel" ? "cancel" : "fallback";
}

function files(ops: { read?: Iterable<string>; written?: Iterable<string>; edited?: Iterable<string> } | undefined) {
	// pi keeps them as Sets, which JSON writes as {}.
	return { read: [...(ops?.read ?? [])], written: [...(ops?.written ?? [])], edited: [...(ops?.edited ?? [])] };
}

async function summarize(method: string, params: Record<string, unknown>, signal: AbortSignal): Promise<Outcome> {
	if (signal.aborted) return { kind: "aborted" };
	let endpoint: Endpoint;
	let connection: Connection;
	try {
		endpoint = endpointFromEnv();
	} catch (error) {
		return { kind: "failed", message: String((error as Error).message) };
	}
	try {
		connection = await Connection.open(endpoint, CONNECT_TIMEOUT_MS);
	} catch (error) {
		return { kind: "failed", message: `cannot reach orchestrator serve at ${describe(endpoint)}: ${(error as Error).message}` };
	}
	const key = randomUUID();
	let giveUp: (() => void) | undefined;
	const onAbort = () => {
		connection.call("summary.cancel", { cancel_key: key }).catch(() => {});
		// The request's own answer (-32003) says the operation settled; a server that never
		// answers must not hold pi.
		setTimeout(() => giveUp?.(), CANCEL_WAIT_MS).unref();
	};
	signal.addEventListener("abort", onAbort, { once: true });
	try {
		const answer = connection.call(method, { ...params, cancel_key: key });
		const abandoned = new Promise<never>((_, reject) => {
			giveUp = () => reject(new Error("no answer to the cancel"));
		});
		return { kind: "ok", result: await Promise.race([answer, abandoned]) };
	} catch (error) {
		if (signal.aborted) return { kind: "aborted" };
		const code = error instanceof RpcFailure ? ` (${error.code})` : "";
		return { kind: "failed", message: `orchestrator serve failed${code}: ${(error as Error).message}` };
	} finally {
		signal.removeEventListener("abort", onAbort);
		connection.close();
	}
}

type Notify = (message: string, level: "info" | "warning" | "error") => void;

function notifier(ctx: any): Notify {
	return (message, level) => {
		if (ctx?.hasUI !== false && ctx?.ui?.notify) ctx.ui.notify(message, level);
		else console.error(message);
	};
}

/** What to tell pi after a failure: nothing (its own compaction runs), or cancel. */
function failed(notify: Notify, what: string, message: string, mode: Mode): { cancel: true } | undefined {
	if (mode === "cancel") {
		notify(`orchestrator: ${message}; ${what} cancelled (ORCHESTRATOR_ON_FAILURE=cancel)`, "error");
		return { cancel: true };
	}
	notify(`orchestrator: ${message}; pi's own ${what} runs instead`, "warning");
	return undefined;
}

function sessionOf(ctx: any): { session_file?: string; session_id?: string } {
	const manager = ctx?.sessionManager;
	return { session_file: manager?.getSessionFile?.() ?? undefined, session_id: manager?.getSessionId?.() ?? undefined };
}

export default function orchestrator(pi: ExtensionAPI) {
	pi.on("session_before_compact", async (event, ctx) => {
		const notify = notifier(ctx);
		const { preparation } = event;
		const outcome = await summarize(
			"summary.compact",
			{
				...sessionOf(ctx),
				preparation: { ...preparation, fileOps: files(preparation.fileOps) },
				custom_instructions: event.customInstructions,
				reason: event.reason,
				will_retry: event.willRetry,
			},
			event.signal,
		);
		if (outcome.kind === "aborted") return { cancel: true };
		if (outcome.kind === "failed") return failed(notify, "compaction", outcome.message, failureMode());
		const result = outcome.result;
		return {
			compaction: {
				summary: result.summary,
				firstKeptEntryId: result.firstKeptEntryId,
				tokensBefore: result.tokensBefore,
				details: result.details,
				...(result.usage ? { usage: result.usage } : {}),
			},
		};
	});

	pi.on("session_before_tree", async (event, ctx) => {
		const { preparation } = event;
		if (!preparation.userWantsSummary || preparation.entriesToSummarize.length === 0) return undefined;
		const notify = notifier(ctx);
		const outcome = await summarize(
			"summary.branch",
			{
				...sessionOf(ctx),
				preparation: {
					entriesToSummarize: preparation.entriesToSummarize,
					oldLeafId: preparation.oldLeafId,
					targetId: preparation.targetId,
					commonAncestorId: preparation.commonAncestorId,
				},
				custom_instructions: preparation.customInstructions,
				replace_instructions: preparation.replaceInstructions,
			},
			event.signal,
		);
		if (outcome.kind === "aborted") return { cancel: true };
		if (outcome.kind === "failed") return failed(notify, "branch summary", outcome.message, failureMode());
		const result = outcome.result;
		return { summary: { summary: result.summary, details: result.details, ...(result.usage ? { usage: result.usage } : {}) } };
	});
}
