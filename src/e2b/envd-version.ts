/**
 * The envd version forkd's E2B API reports for every sandbox (`envdVersion`). E2B's SDKs turn
 * features on by comparing it with the version that brought them (npm e2b 2.51: the newest it
 * checks is 0.6.4, watching on network mounts; 0.5.7 octet-stream uploads, 0.5.2 closing stdin,
 * 0.4.0 the template's default user): forkd's envd (src/e2b/envd) answers all of them.
 */
export const ENVD_VERSION = "0.6.4";
