/* libjpeg error handling shared by shardkit's C extensions: errors jump back to the caller with
 * libjpeg's message (no exit()). Warnings (corrupt but decodable data, e.g. "Corrupt JPEG data:
 * 3 extraneous bytes before marker 0xda") are never printed, as libjpeg's default handler prints
 * the first one to stderr: they are counted (pub.num_warnings) and the first one's text is kept
 * (warning) for the caller to report. "Premature end of JPEG file" is an error here, as in
 * torchvision's decoder and PIL: a truncated image is not delivered with its missing rows grey. */
#ifndef SHARDKIT_JPEG_ERRORS_H
#define SHARDKIT_JPEG_ERRORS_H
#include <setjmp.h>
#include <stdio.h>
#include <jpeglib.h>
#include <jerror.h>

struct error_manager {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];  /* the error's text */
    char warning[JMSG_LENGTH_MAX];  /* the first warning's text; "" when there was none */
};

static void on_error(j_common_ptr cinfo) {
    struct error_manager *err = (struct error_manager *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    struct error_manager *err = (struct error_manager *)cinfo->err;
    if (level >= 0) return;  /* trace messages */
    if (cinfo->err->msg_code == JWRN_JPEG_EOF) on_error(cinfo);  /* truncated: does not return */
    if (cinfo->err->num_warnings++ == 0) (*cinfo->err->format_message)(cinfo, err->warning);
}

/* Set up `err` (messages empty, the handlers above); returns what cinfo->err must point to. */
static struct jpeg_error_mgr *errors_init(struct error_manager *err) {
    err->message[0] = '\0';
    err->warning[0] = '\0';
    jpeg_std_error(&err->pub);
    err->pub.error_exit = on_error;
    err->pub.emit_message = on_message;
    return &err->pub;
}
#endif
