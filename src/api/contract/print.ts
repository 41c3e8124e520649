/**
 * Prints the REST API's OpenAPI document, built from the routes' contract (no daemon needed):
 * `npm run openapi` writes it to docs/openapi.json. (The CLI's `forkd openapi` asks the running
 * daemon instead: the CLI holds no daemon code.)
 */
import { VERSION } from "../../host/index.js";
import { buildOpenApi } from "./openapi.js";

process.stdout.write(JSON.stringify(buildOpenApi(VERSION), null, 2) + "\n");
