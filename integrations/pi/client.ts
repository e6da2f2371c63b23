// A small JSON-RPC 2.0 client for `orchestrator serve`: one message per line, over its Unix
// socket (mode 0600, so only its owner connects) or over loopback TCP after the `auth` line
// with the server's token. Node built-ins only: pi loads this file as it is, no build step.

import { readFileSync } from "node:fs";
import { connect, type Socket } from "node:net";
import { homedir } from "node:os";
import { join } from "node:path";

/** Where the server listens: a Unix socket, or a loopback port with the token to present. */
export type Endpoint = { path: string } | { host: string; port: number; token: string };

/** The default socket when ORCHESTRATOR_SOCKET is not set (docs/pi-extension.md). */
export const DEFAULT_SOCKET = join(homedir(), ".orchestrator.sock");

/** The endpoint from the environment: ORCHESTRATOR_PORT (+ _HOST, _TOKEN_FILE), else the socket. */
export function endpointFromEnv(env: NodeJS.ProcessEnv = process.env): Endpoint {
	if (env.ORCHESTRATOR_PORT) {
		const port = Number(env.ORCHESTRATOR_PORT);
		if (!Number.isInteger(port) || port <= 0 || port > 65535) {
			throw new Error(`ORCHESTRATOR_PORT=${env.ORCHESTRATOR_PORT} is not a port number`);
		}
		const tokenFile = env.ORCHESTRATOR_TOKEN_FILE;
		if (!tokenFile) throw new Error("ORCHESTRATOR_PORT needs ORCHESTRATOR_TOKEN_FILE (the server's token)");
		const token = readFileSync(tokenFile, "utf8").trim();
		return { host: env.ORCHESTRATOR_HOST || "127.0.0.1", port, token };
	}
	return { path: env.ORCHESTRATOR_SOCKET || DEFAULT_SOCKET };
}

export function describe(endpoint: Endpoint): string {
	return "path" in endpoint ? endpoint.path : `${endpoint.host}:${endpoint.port}`;
}

/** An error answer of the server: its code, one-line message and data. */
export class RpcFailure extends Error {
	readonly code: number;
	readonly data: unknown;

	constructor(code: number, message: string, data: unknown) {
		super(message);
		this.code = code;
		this.data = data;
	}
}

type Waiter = { resolve: (value: unknown) => void; reject: (error: Error) => void };

/** One connection; requests are answered by id, in any order. */
export class Connection {
	private buffer = "";
	private nextId = 1;
	private readonly waiting = new Map<number, Waiter>();
	private closed: Error | undefined;
	private readonly socket: Socket;

	private constructor(socket: Socket) {
		this.socket = socket;
		socket.setEncoding("utf8");
		socket.on("data", (chunk: string) => this.read(chunk));
		const end = (error?: Error) => this.fail(error ?? new Error("the server closed the connection"));
		socket.on("error", end);
		socket.on("close", () => end());
	}

	/** Connect (and present the token on TCP) within `timeoutMs`. */
	static async open(endpoint: Endpoint, timeoutMs: number): Promise<Connection> {
		const socket = "path" in endpoint ? connect(endpoint.path) : connect(endpoint.port, endpoint.host);
		await new Promise<void>((resolve, reject) => {
			const timer = setTimeout(() => {
				socket.destroy();
				reject(new Error(`no connection within ${timeoutMs} ms`));
			}, timeoutMs);
			socket.once("connect", () => (clearTimeout(timer), resolve()));
			socket.once("error", (error) => (clearTimeout(timer), reject(error)));
		});
		const connection = new Connection(socket);
		if (!("path" in endpoint)) await connection.call("auth", { token: endpoint.token });
		return connection;
	}

	call(method: string, params: Record<string, unknown>): Promise<any> {
		if (this.closed) return Promise.reject(this.closed);
		const id = this.nextId++;
		const line = `${JSON.stringify({ jsonrpc: "2.0", id, method, params })}\n`;
		return new Promise((resolve, reject) => {
			this.waiting.set(id, { resolve, reject });
			this.socket.write(line);
		});
	}

	close(): void {
		this.socket.end();
		this.socket.destroy();
	}

	private read(chunk: string): void {
		this.buffer += chunk;
		for (let at = this.buffer.indexOf("\n"); at >= 0; at = this.buffer.indexOf("\n")) {
			const line = this.buffer.slice(0, at);
			this.buffer = this.buffer.slice(at + 1);
			if (line.trim()) this.answer(line);
		}
	}

	private answer(line: string): void {
		let message: any;
		try {
			message = JSON.parse(line);
		} catch {
			this.fail(new Error(`the server sent a line that is not JSON: ${line.slice(0, 200)}`));
			return;
		}
		if (Array.isArray(message) || typeof message?.id !== "number") {
			// A notification (session.event), or an error without an id: a request it refused
			// as a whole (`id: null`) ends the connection, as every request on it may be lost.
			if (message?.error && message.id === null) this.fail(failure(message.error));
			return;
		}
		const waiter = this.waiting.get(message.id);
		if (!waiter) return;
		this.waiting.delete(message.id);
		if (message.error) waiter.reject(failure(message.error));
		else waiter.resolve(message.result);
	}

	private fail(error: Error): void {
		if (this.closed) return;
		this.closed = error;
		for (const waiter of this.waiting.values()) waiter.reject(error);
		this.waiting.clear();
		this.socket.destroy();
	}
}

function failure(error: any): RpcFailure {
	return new RpcFailure(Number(error?.code), String(error?.message ?? "error"), error?.data);
}
