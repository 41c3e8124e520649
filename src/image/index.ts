/**
 * What image offers: guest images (kernel, initramfs, root filesystem) and Dockerfile builds in a
 * jailed build VM. Other folders import this folder through this file alone
 * (test/unit/layering.test.ts).
 */
export { ImageBuilder } from "./builder.js";
export type { GuestImage } from "./builder.js";
export { IMAGE_FILES, findImage, imageAddress, importedDir, recordedImageSums } from "./content.js";
export type { ImageFile } from "./content.js";
export { buildDockerfile } from "./dockerfile/build.js";
export type { BaseImage, BuildNetwork, DockerfileBuildResult, FromResolver } from "./dockerfile/build.js";
export { unpackContext } from "./dockerfile/context-tar.js";
export { IgnoreRules, cleanRelative } from "./dockerfile/ignore.js";
export { DOCKERFILE_LIMITS } from "./dockerfile/lines.js";
export { EMPTY_CONFIG } from "./dockerfile/plan.js";
export { StepCache } from "./dockerfile/step-cache.js";
export { envMap } from "./forkd-files.js";
export { LocalImages } from "./local-images.js";
export type { ImageResolver } from "./rootfs-image.js";
export { ImageSource, TemplateSource } from "./source.js";
